"""The step toolkit: the StepPlan a step is built from, its batches, the calls into the user's model and loss, graph capture, its phases and their timers."""
