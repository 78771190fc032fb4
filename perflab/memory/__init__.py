"""Memory: one step's peak broken down by category (breakdown), the peak
predicted at any batch (fit), the largest batch that fits (search) and what each lever would free (levers)."""
