"""Differential privacy maths: noise, the budget split, accounting, selection, planning."""
