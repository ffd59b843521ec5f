"""Pure math on measured numbers: distributions, knees, trends, bootstrap intervals, cost,
the Pareto front.

The ground floor of the analysis: these modules take numpy arrays and plain numbers and
import nothing else from tradeoff, so bench, analysis and report can all build on them.
"""
