"""gptedge.measure: measurement, outside the torch-free core. Perplexity / size tables of several model dirs
(compare, classify_compare), their pareto front and plot (frontier, plot), latency rows (bench), and the
other engines measured on the same checkpoint (peers). It imports gptedge.runtime; gptedge.runtime never
imports it (tests/project/test_structure.py)."""
