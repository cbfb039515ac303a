# The broker's role: the resource SKU reads its price poller makes (zones, restrictions), plus what
# SkyPilot's Azure provisioner does (resource groups, deployments, VMs, disks, networking, the
# node identity). The Retail Prices API needs no credentials.

data "azurerm_subscription" "current" {}

resource "azurerm_resource_group" "broker" {
  name     = "${var.name_prefix}-broker"
  location = var.location
  tags     = var.tags
}

resource "azurerm_role_definition" "broker" {
  name        = "${var.name_prefix}-broker"
  scope       = data.azurerm_subscription.current.id
  description = "Spot broker: resource SKUs, and SkyPilot's VM provisioning"
  permissions {
    actions = [
      # the broker
      "Microsoft.Compute/skus/read",
      "Microsoft.Compute/locations/*/read",
      # the Spot Placement Score (POST .../locations/{region}/placementScores/spot/generate)
      "Microsoft.Compute/locations/placementScores/generate/action",
      # SkyPilot
      "Microsoft.Resources/subscriptions/resourceGroups/read",
      "Microsoft.Resources/subscriptions/resourceGroups/write",
      "Microsoft.Resources/subscriptions/resourceGroups/delete",
      "Microsoft.Resources/deployments/*",
      "Microsoft.Compute/virtualMachines/*",
      "Microsoft.Compute/disks/*",
      "Microsoft.Network/virtualNetworks/*",
      "Microsoft.Network/networkSecurityGroups/*",
      "Microsoft.Network/networkInterfaces/*",
      "Microsoft.Network/publicIPAddresses/*",
      "Microsoft.ManagedIdentity/userAssignedIdentities/read",
      "Microsoft.ManagedIdentity/userAssignedIdentities/write",
      "Microsoft.ManagedIdentity/userAssignedIdentities/assign/action",
    ]
    not_actions = []
  }
  assignable_scopes = [data.azurerm_subscription.current.id]
}

resource "azurerm_role_assignment" "broker" {
  scope              = data.azurerm_subscription.current.id
  role_definition_id = azurerm_role_definition.broker.role_definition_resource_id
  principal_id       = var.broker_principal_id
}

resource "azurerm_storage_account" "checkpoints" {
  #checkov:skip=CKV2_AZURE_1:encrypted at rest with Microsoft-managed keys plus infrastructure (double) encryption; a customer-managed key needs a Key Vault this module does not own
  #checkov:skip=CKV2_AZURE_33:reached through the nodes' subnet service endpoints (network_rules), not a private endpoint, since SkyPilot creates each cluster's network on the fly
  #checkov:skip=CKV_AZURE_59:public network access stays on only as far as network_rules allow (default deny); SkyPilot's per-cluster networks cannot be known here
  name                              = var.storage_account_name
  resource_group_name               = azurerm_resource_group.broker.name
  location                          = var.location
  account_tier                      = "Standard"
  account_replication_type          = "GRS"
  min_tls_version                   = "TLS1_2"
  https_traffic_only_enabled        = true
  allow_nested_items_to_be_public   = false
  shared_access_key_enabled         = false
  infrastructure_encryption_enabled = true
  tags                              = var.tags

  network_rules {
    default_action             = "Deny"
    bypass                     = ["AzureServices", "Logging", "Metrics"]
    ip_rules                   = var.allowed_ip_ranges
    virtual_network_subnet_ids = var.allowed_subnet_ids
  }

  blob_properties {
    versioning_enabled = true
    delete_retention_policy {
      days = var.checkpoint_retention_days
    }
    container_delete_retention_policy {
      days = var.checkpoint_retention_days
    }
  }

  queue_properties {
    logging {
      delete                = true
      read                  = true
      write                 = true
      version               = "1.0"
      retention_policy_days = 30
    }
  }

  sas_policy {
    expiration_period = "01.00:00:00"
  }
}

resource "azurerm_storage_container" "checkpoints" {
  #checkov:skip=CKV2_AZURE_21:blob read logging is configured on the account (queue_properties.logging and diagnostic settings are the operator's choice of workspace)
  name                  = "checkpoints"
  storage_account_name  = azurerm_storage_account.checkpoints.name
  container_access_type = "private"
}

# The broker and its nodes read and write checkpoints in this account only, with Azure AD (shared keys are off).
resource "azurerm_role_assignment" "checkpoints" {
  scope                = azurerm_storage_account.checkpoints.id
  role_definition_name = "Storage Blob Data Contributor"
  principal_id         = var.broker_principal_id
}
