"""Building variants of a registered architecture and loading them (see `variants.runtimes`)."""
