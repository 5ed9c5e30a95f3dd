"""The architects' Streamlit dashboard (`unmask dashboard`): read-only views of the registry."""
