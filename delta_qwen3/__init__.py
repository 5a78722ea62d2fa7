"""The `delta-qwen3` command line and the small pieces its subcommands share."""
