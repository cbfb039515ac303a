# The broker's own calls (providers/aws.py, the SQS notice reader, checkpoints) plus what SkyPilot
# needs to launch and tear down nodes. SkyPilot's part follows its documented minimal AWS policy:
# https://docs.skypilot.co/en/latest/cloud-setup/cloud-permissions/aws.html ("Minimal Permissions").

data "aws_iam_policy_document" "assume" {
  statement {
    sid     = "BrokerHosts"
    actions = ["sts:AssumeRole"]
    principals {
      type        = "AWS"
      identifiers = var.broker_principal_arns
    }
  }
}

resource "aws_iam_role" "broker" {
  name                 = "${var.name_prefix}-broker"
  description          = "Assumed by the hosts running broker serve"
  assume_role_policy   = data.aws_iam_policy_document.assume.json
  max_session_duration = 3600
}

data "aws_iam_policy_document" "broker" {
  #checkov:skip=CKV_AWS_356:only SkyPilot's documented ec2:Describe* on "*" trips this; SkyPilot calls Describe APIs that change between its versions, and its minimal policy grants them this way
  # -- the broker: prices, capacity signals and the GPU catalog (read-only) --
  statement {
    sid = "MarketReadOnly"
    actions = [
      "ec2:DescribeSpotPriceHistory",
      "ec2:DescribeInstanceTypes",
      "ec2:DescribeInstanceTypeOfferings",
      "ec2:DescribeAvailabilityZones",
      "ec2:GetSpotPlacementScores",
      "pricing:GetProducts",
    ]
    # These actions have no resource-level permissions: AWS only accepts "*" for them.
    resources = ["*"]
  }

  # -- the broker: spot interruption warnings and rebalance recommendations from the queue --
  statement {
    sid       = "InterruptionQueue"
    actions   = ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes", "sqs:GetQueueUrl"]
    resources = [aws_sqs_queue.interruptions.arn]
  }

  # -- the broker and its nodes: checkpoints in the bucket, under its key --
  statement {
    sid       = "CheckpointObjects"
    actions   = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"]
    resources = ["${aws_s3_bucket.checkpoints.arn}/*"]
  }
  statement {
    sid       = "CheckpointBucket"
    actions   = ["s3:ListBucket", "s3:GetBucketLocation"]
    resources = [aws_s3_bucket.checkpoints.arn]
  }
  statement {
    sid       = "CheckpointKey"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = [aws_kms_key.broker.arn]
  }

  # -- SkyPilot (its minimal policy) --
  statement {
    sid       = "SkyPilotRunFromAmis"
    actions   = ["ec2:RunInstances"]
    resources = ["arn:${local.partition}:ec2:*::image/ami-*"]
  }
  statement {
    sid     = "SkyPilotRunInstances"
    actions = ["ec2:RunInstances"]
    resources = [
      "arn:${local.partition}:ec2:*:${local.account}:instance/*",
      "arn:${local.partition}:ec2:*:${local.account}:network-interface/*",
      "arn:${local.partition}:ec2:*:${local.account}:subnet/*",
      "arn:${local.partition}:ec2:*:${local.account}:volume/*",
      "arn:${local.partition}:ec2:*:${local.account}:security-group/*",
    ]
  }
  statement {
    sid       = "SkyPilotManageInstances"
    actions   = ["ec2:TerminateInstances", "ec2:DeleteTags", "ec2:StartInstances", "ec2:CreateTags", "ec2:StopInstances"]
    resources = ["arn:${local.partition}:ec2:*:${local.account}:instance/*"]
  }
  statement {
    sid     = "SkyPilotDescribe"
    actions = ["ec2:Describe*"]
    # Describe calls have no resource-level permissions: AWS only accepts "*" for them.
    resources = ["*"]
  }
  statement {
    sid       = "SkyPilotSecurityGroups"
    actions   = ["ec2:CreateSecurityGroup", "ec2:AuthorizeSecurityGroupIngress"]
    resources = ["arn:${local.partition}:ec2:*:${local.account}:security-group/*", "arn:${local.partition}:ec2:*:${local.account}:vpc/*"]
  }
  statement {
    sid       = "SkyPilotNodeRole"
    actions   = ["iam:GetRole", "iam:PassRole"]
    resources = ["arn:${local.partition}:iam::${local.account}:role/${var.skypilot_role_name}"]
  }
  statement {
    sid       = "SkyPilotNodeProfile"
    actions   = ["iam:GetInstanceProfile"]
    resources = ["arn:${local.partition}:iam::${local.account}:instance-profile/${var.skypilot_role_name}"]
  }
}

resource "aws_iam_policy" "broker" {
  name        = "${var.name_prefix}-broker"
  description = "Exactly what the spot broker and SkyPilot call"
  policy      = data.aws_iam_policy_document.broker.json
}

resource "aws_iam_role_policy_attachment" "broker" {
  role       = aws_iam_role.broker.name
  policy_arn = aws_iam_policy.broker.arn
}
