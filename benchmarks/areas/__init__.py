"""One module per area of the benchmark, named after its first `--only` item; each has `measure(bench, items)`,
which prints that area's lines for the items asked for (`benchmarks/bench.py` lists the areas and their items)."""
