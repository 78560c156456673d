"""What a worker process runs beside Temporal: the outbox dispatcher, the lease keeper, the scavenger of
local files, the recovery and sweeper Schedules, and the registration of search attributes."""
