"""Drawing a report: shared presentation (`present`), Markdown (`report_md`), HTML
(`report_html`), plots (`plots`), and the files of one report (`build`).
"""
