"""What comes in: a group or rollout checked and stored once, its work planned."""
