"""The GPU self-check, `python -m benchmarks.gpu_check` (`make gpu-check`): `driver.py` has its command line and
says what it checks. One module per section (`implementations`, `attention`, `compile`, `performance`, `learning`,
`serving`), beside what they share: the GPU and rehearsal profiles (`profiles`), comparing results (`comparing`),
running the sections within their budgets (`running`) and the report (`report`)."""
