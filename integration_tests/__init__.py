"""Integration tests against a real S3 server (marker ``integration``); see docs/s3.md."""
