"""Credit-aggregator service: turns a group's stored judgments into credits and advantages."""
