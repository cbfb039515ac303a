# The checkpoint bucket: private, versioned, encrypted with the broker's KMS key, access logged.

data "aws_iam_policy_document" "key" {
  #checkov:skip=CKV_AWS_111:a key policy; "*" is this key alone, and the account-root statement is AWS's default key policy that lets IAM policies (the broker's) grant use of it
  #checkov:skip=CKV_AWS_356:a key policy; "*" is this key alone
  #checkov:skip=CKV_AWS_109:a key policy; without the account-root statement the key would become unmanageable
  statement {
    sid       = "AccountAdministers"
    actions   = ["kms:*"]
    resources = ["*"] # in a key policy "*" means this key
    principals {
      type        = "AWS"
      identifiers = ["arn:${local.partition}:iam::${local.account}:root"]
    }
  }
  statement {
    sid       = "EventBridgeEncryptsToTheQueue"
    actions   = ["kms:GenerateDataKey", "kms:Decrypt"]
    resources = ["*"] # in a key policy "*" means this key
    principals {
      type        = "Service"
      identifiers = ["events.amazonaws.com"]
    }
  }
}

resource "aws_kms_key" "broker" {
  description             = "Spot broker: checkpoints and the interruption queue"
  enable_key_rotation     = true
  deletion_window_in_days = 30
  policy                  = data.aws_iam_policy_document.key.json
}

resource "aws_kms_alias" "broker" {
  name          = "alias/${var.name_prefix}"
  target_key_id = aws_kms_key.broker.key_id
}

resource "aws_s3_bucket" "checkpoints" {
  #checkov:skip=CKV_AWS_144:checkpoints are rewritten every few minutes and only useful in the region the jobs run; replication would double the cost for data that is stale in minutes
  #checkov:skip=CKV2_AWS_62:nothing reacts to checkpoint writes; the broker learns of them from its agents
  bucket_prefix = "${var.name_prefix}-checkpoints-"
}

resource "aws_s3_bucket" "access_logs" {
  #checkov:skip=CKV_AWS_144:access logs of a regional checkpoint bucket need no second region
  #checkov:skip=CKV2_AWS_62:nothing reacts to access-log writes
  #checkov:skip=CKV_AWS_18:this is the access-log bucket; logging it to itself would loop
  bucket_prefix = "${var.name_prefix}-access-logs-"
}

resource "aws_s3_bucket_logging" "checkpoints" {
  bucket        = aws_s3_bucket.checkpoints.id
  target_bucket = aws_s3_bucket.access_logs.id
  target_prefix = "checkpoints/"
}

resource "aws_s3_bucket_public_access_block" "checkpoints" {
  bucket                  = aws_s3_bucket.checkpoints.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_public_access_block" "access_logs" {
  bucket                  = aws_s3_bucket.access_logs.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_ownership_controls" "checkpoints" {
  bucket = aws_s3_bucket.checkpoints.id
  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_versioning" "checkpoints" {
  bucket = aws_s3_bucket.checkpoints.id
  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_versioning" "access_logs" {
  bucket = aws_s3_bucket.access_logs.id
  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "checkpoints" {
  bucket = aws_s3_bucket.checkpoints.id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = aws_kms_key.broker.arn
    }
    bucket_key_enabled = true
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "access_logs" {
  bucket = aws_s3_bucket.access_logs.id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = aws_kms_key.broker.arn
    }
    bucket_key_enabled = true
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "checkpoints" {
  bucket = aws_s3_bucket.checkpoints.id
  rule {
    id     = "expire-old-checkpoint-versions"
    status = "Enabled"
    filter {}
    noncurrent_version_expiration {
      noncurrent_days = var.checkpoint_retention_days
    }
    abort_incomplete_multipart_upload {
      days_after_initiation = 1
    }
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "access_logs" {
  bucket = aws_s3_bucket.access_logs.id
  rule {
    id     = "expire-access-logs"
    status = "Enabled"
    filter {}
    expiration {
      days = 90
    }
    noncurrent_version_expiration {
      noncurrent_days = 7
    }
    abort_incomplete_multipart_upload {
      days_after_initiation = 1
    }
  }
}

data "aws_iam_policy_document" "checkpoints_tls" {
  statement {
    sid       = "DenyPlainHttp"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [aws_s3_bucket.checkpoints.arn, "${aws_s3_bucket.checkpoints.arn}/*"]
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_s3_bucket_policy" "checkpoints" {
  bucket = aws_s3_bucket.checkpoints.id
  policy = data.aws_iam_policy_document.checkpoints_tls.json
}
