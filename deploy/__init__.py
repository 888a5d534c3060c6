"""The toolkit: cluster model, inventory, plan and facts."""
