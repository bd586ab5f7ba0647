"""Pure planning decisions (offering search, plan schedule): snapshots and `now` in, values out; no I/O."""
