"""Presentation: what renders plans and predictions for people — terminal and HTML reports, pruning reasons, explain, diff, traces and plots."""
