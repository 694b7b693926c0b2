"""The value of the setting this package uses (copied from its file in settings/)."""

VALUE = "unset"
