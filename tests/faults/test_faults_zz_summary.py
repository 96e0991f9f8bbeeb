"""Collected last: makes pytest end its output with the issue's table and
the figures this run measured (see faultlib.SummaryPlugin)."""
from faultlib import RESULTS, SummaryPlugin


def test_figures_table_is_printed_at_the_end(pytestconfig):
    if not pytestconfig.pluginmanager.has_plugin("gg-faults-summary"):
        pytestconfig.pluginmanager.register(SummaryPlugin(), "gg-faults-summary")
    assert isinstance(RESULTS, dict)
