"""Local stand-ins for the clouds: a fake ``modal`` module and a fake veFaaS (API + data plane)."""
