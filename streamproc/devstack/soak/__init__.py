"""``scripts/soak``: the pipeline run for half an hour with batches arriving all the time, a worker SIGKILLed every
five minutes and automatic retention at a short setting, sampled every minute for what would leak."""
