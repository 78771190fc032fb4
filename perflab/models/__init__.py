"""Model building blocks shared by the built-in workloads and generation (they import torch only, no perflab)."""
