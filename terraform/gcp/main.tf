# The broker's service account: the Compute catalog reads the price poller makes, plus what
# SkyPilot needs to launch and tear down nodes, following SkyPilot's documented minimal role:
# https://docs.skypilot.co/en/latest/cloud-setup/cloud-permissions/gcp.html ("Minimal permissions").
# Prices come from the Cloud Billing Catalog API, which takes an API key, not an IAM role.

resource "google_service_account" "broker" {
  account_id   = "${var.name_prefix}-broker"
  display_name = "Spot broker (broker serve and SkyPilot)"
}

resource "google_project_iam_custom_role" "broker" {
  role_id     = replace("${var.name_prefix}_broker", "-", "_")
  title       = "Spot broker"
  description = "The broker's Compute catalog reads and SkyPilot's minimal permissions"
  permissions = [
    # the broker: GPU catalog and zones, and the capacity signals (advice.capacity: obtainability
    # and estimated uptime; advice.capacityHistory: daily preemption rate and price history)
    "compute.acceleratorTypes.list",
    "compute.advice.capacity",
    "compute.advice.capacityHistory",
    "compute.machineTypes.list",
    "compute.regions.list",
    "compute.zones.list",
    # SkyPilot's minimal role
    "compute.disks.create",
    "compute.disks.list",
    "compute.firewalls.create",
    "compute.firewalls.delete",
    "compute.firewalls.get",
    "compute.instances.create",
    "compute.instances.delete",
    "compute.instances.get",
    "compute.instances.list",
    "compute.instances.setLabels",
    "compute.instances.setMetadata",
    "compute.instances.setServiceAccount",
    "compute.instances.start",
    "compute.instances.stop",
    "compute.networks.get",
    "compute.networks.list",
    "compute.networks.getEffectiveFirewalls",
    "compute.globalOperations.get",
    "compute.subnetworks.use",
    "compute.subnetworks.list",
    "compute.subnetworks.useExternalIp",
    "compute.projects.get",
    "compute.zoneOperations.get",
    "iam.roles.get",
    "iam.serviceAccounts.actAs",
    "iam.serviceAccounts.get",
    "serviceusage.services.enable",
    "serviceusage.services.list",
    "serviceusage.services.use",
    "resourcemanager.projects.get",
    "resourcemanager.projects.getIamPolicy",
  ]
}

resource "google_project_iam_member" "broker" {
  project = var.project_id
  role    = google_project_iam_custom_role.broker.id
  member  = "serviceAccount:${google_service_account.broker.email}"
}

resource "google_storage_bucket" "checkpoints" {
  name                        = "${var.name_prefix}-checkpoints-${var.project_id}"
  location                    = var.region
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = false
  labels                      = var.labels

  versioning {
    enabled = true
  }

  encryption {
    default_kms_key_name = var.kms_key_name
  }

  logging {
    log_bucket        = var.log_bucket
    log_object_prefix = "checkpoints/"
  }

  lifecycle_rule {
    condition {
      days_since_noncurrent_time = var.checkpoint_retention_days
    }
    action {
      type = "Delete"
    }
  }
}

# The broker and its nodes read and write checkpoints in this bucket only.
resource "google_storage_bucket_iam_member" "broker" {
  bucket = google_storage_bucket.checkpoints.name
  role   = "roles/storage.objectAdmin"
  member = "serviceAccount:${google_service_account.broker.email}"
}
