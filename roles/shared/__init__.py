"""The one shared layer: pyinfra operations every package uses (ops), kept scripts and templates
over files/ (scripts, templates), apt's list refresh (apt_lists), the running kernel's headers
and hold (kernel), the stop before a step that would end training (guards). No service
package is imported from here. Files: files/shared/.
"""
