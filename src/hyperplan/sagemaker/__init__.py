"""The SageMaker Training Plans and HyperPod node APIs, served over hyperplan's objects.

Platform teams script training plans with boto3 and the AWS CLI; pointed at this server
(``--endpoint-url`` or ``AWS_ENDPOINT_URL_SAGEMAKER``) the same scripts work unchanged:

* :mod:`hyperplan.sagemaker.signing`: AWS Signature Version 4, verified on every request;
* :mod:`hyperplan.sagemaker.wire`: the AWS JSON 1.1 protocol (``X-Amz-Target``, errors as
  ``{"__type", "message"}``, epoch timestamps, opaque page tokens, the checks boto3 leaves to the
  server);
* :mod:`hyperplan.sagemaker.operations`: each operation mapped onto hyperplan's objects, read from
  the operator's watch cache;
* :mod:`hyperplan.sagemaker.server`: the HTTP server, on its own port in the operator's process.

docs/sagemaker-api.md has the table of operations, objects and fields.
"""
