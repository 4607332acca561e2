"""What comes out: aggregation into credits and advantages, the documents, replay and usage."""
