"""The Textual side: the cockpit app and its widgets."""
