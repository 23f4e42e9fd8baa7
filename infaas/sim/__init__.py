"""The trace simulator (DESIGN.md, "Simulator"): the service's pure policies in virtual time.

`traces` makes or reads the arrivals, `zoo` the variants (a data dir's store or a synthetic zoo),
`engine` runs one mode over them, `report` prints and plots what the modes came to.
"""
