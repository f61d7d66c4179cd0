"""The cluster scenario: the pipeline run as a team runs it, across hosts (conftest.py)."""
