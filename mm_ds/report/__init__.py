"""Evaluation records -> the paper's tables, curves, figures and analyses (Table 2 has one renderer: table2.py).
Never imported by runtime, model or stages."""
