"""Reference engines that ragserve is compared with (parity and speed); dev dependencies only."""
