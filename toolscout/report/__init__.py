"""The experiment report as Markdown (:mod:`toolscout.report.tables`) and as one figure in the
spirit of paper Figure 1 (:mod:`toolscout.report.plots`).

Both read only the JSON report dict (:func:`toolscout.experiment.run`), so they
can be regenerated from ``report.json`` alone; its keys are :mod:`toolscout.keys`.
"""
from toolscout.report.plots import figure
from toolscout.report.tables import markdown

__all__ = ["figure", "markdown"]
