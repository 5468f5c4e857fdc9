"""Training-step programs written the way users write them: benchmark inputs for toast."""
