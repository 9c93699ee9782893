"""`flywheel webhook`: signed HTTP triggers for deployments (`app`), signature and token
checks (`signatures`), the memory of deliveries for idempotency (`deliveries`), and
bucket notifications turned into landed objects (`s3_events`)."""
