output "role_definition_id" {
  description = "The broker's custom role."
  value       = azurerm_role_definition.broker.role_definition_resource_id
}

output "storage_account" {
  description = "Storage account holding the checkpoint container."
  value       = azurerm_storage_account.checkpoints.name
}

output "checkpoint_container_url" {
  description = "Container for checkpoints: set broker.checkpoint.dir to az://<account>/checkpoints/<path> in job files."
  value       = "${azurerm_storage_account.checkpoints.primary_blob_endpoint}${azurerm_storage_container.checkpoints.name}"
}
