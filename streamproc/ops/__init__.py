"""What users do: submit, input file checks, status, results export, backfill, lag, run."""
