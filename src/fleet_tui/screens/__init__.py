"""Cockpit screens: main, detail, answer, new task, confirm, help."""
