"""The interpretable models of Lucid (paper section 10), behind the policy's model protocols.

- packing.py     PackingTree: pruned decision tree, Tiny / Medium / Jumbo, explains its split path
- throughput.py  ThroughputModel (EBM per 10-minute slot) and ThroughputForecast (online forecaster)
- duration.py    DurationModel (EBM on log run time with leak-free history features, fallback cold start)
- names.py       JobNameBucketer: Levenshtein distance + affinity propagation
- monotone.py    isotonic (pool-adjacent-violators) shape constraint for an EBM term
- explain.py     per-prediction contributions and shape-function plots
- registry.py    ModelRegistry: versioned artifacts with metadata, promote / load / compare
- synthetic.py   synthetic job logs with recurring users and names
- datasets.py    where the reference data lives and how its files are read
- cli.py         `lucid models ...`
"""
