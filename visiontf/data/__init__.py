"""Datasets, transforms and LightningDataModules."""
