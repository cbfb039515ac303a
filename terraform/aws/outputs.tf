output "broker_role_arn" {
  description = "Role the hosts running `broker serve` assume (AWS_ROLE_ARN, or a profile's role_arn)."
  value       = aws_iam_role.broker.arn
}

output "broker_policy_arn" {
  description = "The broker's policy, to attach elsewhere too (e.g. to a CI user)."
  value       = aws_iam_policy.broker.arn
}

output "interruption_queue_url" {
  description = "SQS queue URL carrying spot interruption warnings and rebalance recommendations."
  value       = aws_sqs_queue.interruptions.id
}

output "checkpoint_bucket" {
  description = "Bucket for checkpoints: set broker.checkpoint.dir to s3://<bucket>/<path> in job files."
  value       = aws_s3_bucket.checkpoints.bucket
}

output "kms_key_arn" {
  description = "KMS key encrypting the checkpoints and the queue."
  value       = aws_kms_key.broker.arn
}
