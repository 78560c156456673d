"""The vocabulary of the seeds: states, codes, outcomes, the job row and the values every layer shares.

No I/O and no imports of the project's other packages: db/, partner/, rules/, workflows/ and the rest build on it.
"""
