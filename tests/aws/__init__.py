"""The real AWS clients (boto3 and the AWS CLI), pinned from PyPI, each in a venv of its own: their
botocore pins python-dateutil below 3, the operator's lock has 4, so they cannot share its venv."""
