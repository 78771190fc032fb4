"""The measurement harness: plan the step, run the timed loop, aggregate trials."""
