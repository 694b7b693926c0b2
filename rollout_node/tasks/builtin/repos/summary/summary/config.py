"""Which aggregate summarize() reports (one of the names in summary.report.AGGREGATES)."""

AGGREGATE = "unset"
