"""Pure decisions with no I/O: policy, cancellation outcomes, cutoff answers, delivery evidence rules,
recovery's reading of evidence and outcome mappings. Each is a function of values, unit-tested alone.
"""
