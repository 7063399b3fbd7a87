"""The re-identification audit: PU attacks on a released class mean and their classifiers."""
