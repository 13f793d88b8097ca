"""What a store that does not take boto3's checksum headers answers becomes one line with the server's reason,
and the AWS setting that turns the headers off where it helps (the S3 storage against SeaweedFS and moto:
tests/integration/test_s3_storage.py)."""

import pytest
from botocore.exceptions import ClientError

from ftrain.workers.storage.s3.boto_client import reason


@pytest.mark.parametrize(
    ("code", "message", "hinted"),
    [
        ("NotImplemented", "A header you provided implies functionality that is not implemented", True),
        ("XAmzContentSHA256Mismatch", "", True),
        ("InvalidArgument", "x-amz-checksum-crc32 header is invalid", True),
        ("InvalidArgument", "Invalid part number", False),
        ("BadDigest", "The Content-Md5 you specified did not match what we received.", False),
        ("NoSuchBucket", "The specified bucket does not exist", False),
    ],
)
def test_a_refusal_of_the_checksum_headers_names_the_standard_switch(
    code: str, message: str, hinted: bool
) -> None:
    """What a store that does not take boto3's checksum headers answers (SeaweedFS and moto both take them,
    so the answers are written out as botocore parses them): one line with the server's reason, plus the AWS
    setting that turns the headers off; damaged bytes (BadDigest) are not a setting to change."""
    error = ClientError({"Error": {"Code": code, "Message": message}}, "PutObject")
    line = reason(error)
    assert line.startswith(code) and "\n" not in line
    assert ("AWS_REQUEST_CHECKSUM_CALCULATION=when_required" in line) == hinted
