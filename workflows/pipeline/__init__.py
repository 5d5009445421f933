"""The pipeline stages as plain typed functions (steps.py): check, rollout, validate, promote, rollback;
and what they hand on (step outputs, paired baseline runs, balance advice, run cost). Called by the CLI and,
through it, by the Argo steps."""
