output "service_account_email" {
  description = "Service account `broker serve` runs as (GOOGLE_APPLICATION_CREDENTIALS or workload identity)."
  value       = google_service_account.broker.email
}

output "custom_role_id" {
  description = "The broker's custom role."
  value       = google_project_iam_custom_role.broker.id
}

output "checkpoint_bucket" {
  description = "Bucket for checkpoints: set broker.checkpoint.dir to gs://<bucket>/<path> in job files."
  value       = google_storage_bucket.checkpoints.name
}
