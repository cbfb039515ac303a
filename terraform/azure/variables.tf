variable "subscription_id" {
  description = "Azure subscription the broker launches in."
  type        = string
}

variable "location" {
  description = "Region of the checkpoint storage account."
  type        = string
  default     = "eastus"
}

variable "name_prefix" {
  description = "Prefix of the resource group and role names."
  type        = string
  default     = "spotbroker"
  validation {
    condition     = can(regex("^[a-z0-9]{3,11}$", var.name_prefix))
    error_message = "name_prefix: expected 3-11 lowercase letters or digits."
  }
}

variable "storage_account_name" {
  description = "Globally unique name of the checkpoint storage account (3-24 lowercase letters and digits)."
  type        = string
  validation {
    condition     = can(regex("^[a-z0-9]{3,24}$", var.storage_account_name))
    error_message = "storage_account_name: expected 3-24 lowercase letters or digits."
  }
}

variable "broker_principal_id" {
  description = "Object id of the service principal or managed identity `broker serve` runs as."
  type        = string
}

variable "allowed_ip_ranges" {
  description = "Public IP ranges (CIDR) allowed to reach the checkpoint storage account besides the subnets below."
  type        = list(string)
  default     = []
}

variable "allowed_subnet_ids" {
  description = "Subnets (with the Microsoft.Storage service endpoint) whose nodes read and write checkpoints."
  type        = list(string)
  default     = []
}

variable "checkpoint_retention_days" {
  description = "Days deleted checkpoint blobs and old versions stay recoverable."
  type        = number
  default     = 30
}

variable "tags" {
  description = "Tags put on every resource."
  type        = map(string)
  default     = { "app" = "spot-broker" }
}
