"""The run directory: every file the login side and the node side both read or write.

The manifest, the run id, the ledger's events and their fold, the table of end causes, a sweep
task's config, the metrics and live-progress files, the checkpoint listing (read without torch)
and the code's provenance. It is the one thing the two sides share: the login side imports this
package and never the node side's (``runtime``, ``checkpoint``, ``fault``, ``doctor``, ``train``,
``job``).
"""
