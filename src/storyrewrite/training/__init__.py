"""Lightning training: one LightningModule and one DataModule for every objective."""
