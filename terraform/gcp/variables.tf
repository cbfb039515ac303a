variable "project_id" {
  description = "GCP project the broker launches in and keeps checkpoints in."
  type        = string
}

variable "region" {
  description = "Location of the checkpoint bucket (a region, e.g. us-central1, or a multi-region such as US)."
  type        = string
  default     = "us-central1"
}

variable "name_prefix" {
  description = "Prefix of the service account, role and bucket names."
  type        = string
  default     = "spot-broker"
  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{4,20}[a-z0-9]$", var.name_prefix))
    error_message = "name_prefix: expected 6-22 lowercase letters, digits or hyphens, starting with a letter."
  }
}

variable "checkpoint_retention_days" {
  description = "Days noncurrent checkpoint object versions are kept before deletion."
  type        = number
  default     = 30
}

variable "kms_key_name" {
  description = "Cloud KMS key (projects/P/locations/L/keyRings/R/cryptoKeys/K) encrypting the checkpoint bucket. The GCS service agent needs roles/cloudkms.cryptoKeyEncrypterDecrypter on it."
  type        = string
}

variable "log_bucket" {
  description = "Existing bucket receiving the checkpoint bucket's access logs."
  type        = string
}

variable "labels" {
  description = "Labels put on the bucket."
  type        = map(string)
  default     = { "app" = "spot-broker" }
}
