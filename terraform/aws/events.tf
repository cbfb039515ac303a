# Spot interruption warnings (two minutes ahead) and rebalance recommendations, from EventBridge
# to an encrypted SQS queue the broker polls: a second path to the node agents' own reports.

resource "aws_sqs_queue" "interruptions" {
  name                       = "${var.name_prefix}-interruptions"
  kms_master_key_id          = aws_kms_key.broker.id
  message_retention_seconds  = 3600 # a warning older than its two minutes is history
  receive_wait_time_seconds  = 20
  visibility_timeout_seconds = 60
}

resource "aws_cloudwatch_event_rule" "spot" {
  name        = "${var.name_prefix}-spot-interruptions"
  description = "EC2 spot interruption warnings and rebalance recommendations"
  event_pattern = jsonencode({
    source      = ["aws.ec2"]
    detail-type = ["EC2 Spot Instance Interruption Warning", "EC2 Instance Rebalance Recommendation"]
  })
}

resource "aws_cloudwatch_event_target" "queue" {
  rule = aws_cloudwatch_event_rule.spot.name
  arn  = aws_sqs_queue.interruptions.arn
}

data "aws_iam_policy_document" "queue" {
  statement {
    sid       = "EventBridgeSends"
    actions   = ["sqs:SendMessage"]
    resources = [aws_sqs_queue.interruptions.arn]
    principals {
      type        = "Service"
      identifiers = ["events.amazonaws.com"]
    }
    condition {
      test     = "ArnEquals"
      variable = "aws:SourceArn"
      values   = [aws_cloudwatch_event_rule.spot.arn]
    }
  }
}

resource "aws_sqs_queue_policy" "interruptions" {
  queue_url = aws_sqs_queue.interruptions.id
  policy    = data.aws_iam_policy_document.queue.json
}
