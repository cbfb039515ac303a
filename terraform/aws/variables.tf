variable "region" {
  description = "Region of the interruption queue, the checkpoint bucket and the EventBridge rule. Spot interruption events are regional: apply once per region the broker launches in (with distinct name_prefix values), or forward events across regions."
  type        = string
  default     = "us-east-1"
}

variable "name_prefix" {
  description = "Prefix of every resource name (queue, bucket, policy, role, KMS alias)."
  type        = string
  default     = "spot-broker"
  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9-]{1,30}[a-z0-9]$", var.name_prefix))
    error_message = "name_prefix: expected 3-32 lowercase letters, digits or hyphens."
  }
}

variable "broker_principal_arns" {
  description = "IAM principals (users or roles) that run `broker serve` and may assume the broker role, e.g. [\"arn:aws:iam::123456789012:role/broker-host\"]."
  type        = list(string)
}

variable "skypilot_role_name" {
  description = "Name of the IAM role SkyPilot attaches to the nodes it launches (SkyPilot's default is skypilot-v1)."
  type        = string
  default     = "skypilot-v1"
}

variable "checkpoint_retention_days" {
  description = "Days noncurrent checkpoint object versions are kept before expiry."
  type        = number
  default     = 30
}

variable "tags" {
  description = "Tags put on every resource."
  type        = map(string)
  default     = { "app" = "spot-broker" }
}
