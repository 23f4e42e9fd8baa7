"""Load a variant by its record and run batches: one module per runtime, frameworks imported lazily."""
